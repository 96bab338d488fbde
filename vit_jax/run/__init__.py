"""The run: the loop, optimizer, mesh and shardings, storage, records and checks."""

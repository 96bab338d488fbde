"""Whole runs through the command line: main, predict, the errors a user
sees, several processes, the notebooks."""

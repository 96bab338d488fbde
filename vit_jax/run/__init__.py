"""The run: the loop, its progress lines, the optimizer, the checks every run
shares and the workdir's record. It is handed a task."""

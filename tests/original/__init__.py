"""The original release's API and its notebook."""

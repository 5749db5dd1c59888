"""The stager command line."""

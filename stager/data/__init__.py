"""The data server: one storage target of chunk files."""

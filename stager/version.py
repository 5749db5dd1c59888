"""The package's version, at the bottom of the layers so that any module may import it."""

__version__ = "0.1.0"

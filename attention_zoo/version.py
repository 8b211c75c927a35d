"""The package's version, in a module of its own so that code inside the package can record it
without importing the package's top level."""

__version__ = "0.1.0"

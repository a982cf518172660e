"""dis: the Data Import Server (imports as ``disd``)."""

__version__ = "0.1.0"

"""The version of atlas-core (also `atlas_core.__version__`)."""

__version__ = "0.1.0"

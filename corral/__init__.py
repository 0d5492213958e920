"""corral: a GPU-aware scheduler for jobs and services with one placement engine for every face."""

__version__ = "0.1.0"

"""infercost: what every token costs, per model and model version, on GPU inference fleets."""

__version__ = "0.1.0"

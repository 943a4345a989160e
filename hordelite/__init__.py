"""hordelite: a self-hostable AI Horde for text and chat generation."""

__version__ = "0.1.0"

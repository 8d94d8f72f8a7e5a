"""autoprec graph passes (analysis and rewrite), one pass per module."""

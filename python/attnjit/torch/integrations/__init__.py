"""Integrations of attnjit.torch with other libraries (docs/transformers.md)."""

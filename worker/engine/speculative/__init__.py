"""Speculative decoding for the built-in engine (see ``speculator``)."""

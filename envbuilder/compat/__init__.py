"""Compatibility knowledge: the version catalog (data, with sources) and the rules over it."""

"""Runnable examples shipped with gradloop (so that the installed `gradloop demo` finds them)."""

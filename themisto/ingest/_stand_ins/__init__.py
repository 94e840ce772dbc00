"""Modules Themisto places in a replay workspace in place of helpers the real sessions imported."""

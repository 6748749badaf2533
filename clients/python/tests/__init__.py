"""Tests of the attnd Python client (unittest; they start build/attnd)."""

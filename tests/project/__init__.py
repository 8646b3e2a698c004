"""Tests of the project as shipped: the docs, the wheel, the scripts, and the contract that every shipped config
means the same DAPO on both engines."""

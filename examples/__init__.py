"""Example environments written only against the public protocol (core/envs/base.py)."""

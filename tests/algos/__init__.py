"""Tests of baton.algos (a package so test module names cannot clash with other test folders)."""

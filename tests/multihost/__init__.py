"""Tests of spmd_guide.multihost (a package, so that test modules of the same name in two topics do not collide)."""

"""Tests of spmd_guide.meshes (a package, so that test modules of the same name in two topics do not collide)."""

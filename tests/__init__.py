"""The tests, grouped as the packages are (docs/testing.md, "Layout"); a package per folder, so that two folders may
hold files of the same name. verl and transferqueue install a top-level ``tests`` package of their own into
site-packages: pytest puts the repository (the folder above this package) first on ``sys.path`` before it imports a
test, so ``tests`` is this one."""

"""A third-party package that plugs a model into tensordiff by entry point only (a test fixture).

Its dist-info (`tdtoy-0.1.0.dist-info/entry_points.txt`) registers `toy-gray` in the
`tensordiff.models` group; putting this directory on sys.path is what `pip install` would do.
"""

"""The toolkit's version, recorded in every dump and report."""

VERSION = "0.1.0"

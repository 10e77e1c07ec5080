"""The Pulumi program's pieces: typed settings from stack config, then the resources built from them."""

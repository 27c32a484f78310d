"""Data layer: DBN decoding, features, labels, sidecars, folds and the window loader."""

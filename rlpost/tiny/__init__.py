"""The tiny-model world: building, warming up and measuring the models rlpost makes itself."""

"""The CrossGuard policy pack for mirrorkit stacks; the rules live in `rules` so tests can run them."""

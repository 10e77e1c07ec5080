"""AWS pieces: reaching MSK from a site, the SCRAM secret, the mirror's IAM role."""

"""Interaction logs in, vocabulary, sequences and the leave-one-out split out."""

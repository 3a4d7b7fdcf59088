"""What a running sweep shows its user: counts from the executor's events, a live view on a
terminal, plain status lines elsewhere."""

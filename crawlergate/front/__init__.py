"""The front server in front of the gate: its nginx include, and the crawler hits it answers by itself."""

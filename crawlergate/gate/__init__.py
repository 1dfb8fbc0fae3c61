"""The live gate: the crawler sequence (engine), guest fills, where pages come from, answers."""

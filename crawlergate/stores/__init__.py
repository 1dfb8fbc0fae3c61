"""Cache stores: L1 in memory or memcached, L2 on disk. All hold serialised pages by key digest."""

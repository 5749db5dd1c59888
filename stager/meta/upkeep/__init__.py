"""Upkeep of stored data: rebuild, repair, scrub and fsck, and the re-placement
policies they use."""

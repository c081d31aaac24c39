"""Running one model replica over several ranks: a rank joins its replica in `world`."""

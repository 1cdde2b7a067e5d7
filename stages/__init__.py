"""Stage implementations for omnitrio. Stages are synchronous: no trio in here."""

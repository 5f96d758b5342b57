"""The admin dashboard: who is being limited, by which rule, and a key's state with a reset."""

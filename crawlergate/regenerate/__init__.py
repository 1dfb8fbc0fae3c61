"""Off-peak regeneration: a pass under a budget (regenerator), Azar et al.'s rates (rates), the window (schedule)."""

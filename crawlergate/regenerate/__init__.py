"""Off-peak regeneration: a pass (regenerator) under a budget (budget), Azar et al.'s rates (rates), the window
(window), the lease (lease) and the APScheduler job (schedule), and what is kept beside the page catalogue
(state)."""

"""Handoffs: jobs passed between agents by role (jobs, flow, review, board), the agents
and roles themselves (agents), the rules without a database (rules), and the bridge that
lets workers take part (bridge)."""

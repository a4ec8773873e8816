"""The OpenAI-compatible API: handlers, placement policy, budget, costs, local and cloud calls."""

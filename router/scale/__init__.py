"""Each target's phase: state, activity, holds, the pure scaling decisions, the lifecycle."""

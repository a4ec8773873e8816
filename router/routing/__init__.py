"""Which target a request is for and what to do with it: match, dispatch, the waiting page."""

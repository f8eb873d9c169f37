BOUND = None

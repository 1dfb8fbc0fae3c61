"""The live gate, free of any server interface: a request (request), its decision (engine), the crawler flow
(flow), guest fills (fill, storable, origin), answers (answer), marking pages changed (invalidate, writes)."""

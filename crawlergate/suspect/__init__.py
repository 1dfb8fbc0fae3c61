"""Crawlers that hide behind browser user agents: evidence, verified search engines, the policy table."""

"""The tests' private PostgreSQL cluster: the one ``agentledger chaos --pg-private`` uses."""

from agentledger._chaos.pgcluster import ClusterUnavailable, PrivateCluster, find_bindir, free_port

__all__ = ["ClusterUnavailable", "PrivateCluster", "find_bindir", "free_port"]

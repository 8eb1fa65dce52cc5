"""clusterctl command-line interface: thin glue over the cluster, preflight and eas_agent libraries."""

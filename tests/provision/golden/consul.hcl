# Ansible managed
datacenter = "dc1"
node_name  = "r01n01"
data_dir   = "/opt/consul"
bind_addr  = "127.0.1.11"
client_addr = "127.0.1.11"
ports {
  http = 8500
}
server     = true
bootstrap_expect = 1
ui_config {
  enabled = true
}
retry_join = ["127.0.1.11"]
leave_on_terminate = false
enable_local_script_checks = false
encrypt = "<secret>"
tls {
  defaults {
    ca_file         = "/etc/consul.d/tls/ca.pem"
    cert_file       = "/etc/consul.d/tls/server.pem"
    key_file        = "/etc/consul.d/tls/server-key.pem"
    verify_incoming = true
    verify_outgoing = true
  }
  internal_rpc {
    verify_server_hostname = true
  }
}
auto_encrypt {
  allow_tls = true
}
acl {
  enabled                  = true
  default_policy           = "deny"
  enable_token_persistence = true
  tokens {
    initial_management = "<secret>"
    agent = "<secret>"
    config_file_service_registration = "<secret>"
  }
}

"""`python -m fedldp.collector ...` is `fedldp collector ...` (serve, mint-token, gen-secret)."""

from fedldp.cli_collector import collector

if __name__ == "__main__":
    collector(prog_name="fedldp collector")

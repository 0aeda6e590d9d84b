//! softrdma-pcap: being written.

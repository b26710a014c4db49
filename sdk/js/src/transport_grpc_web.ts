/** connect-web's gRPC-Web transport, alone: transport_connect.ts imports this module on first use. */
export { createGrpcWebTransport } from "@connectrpc/connect-web";

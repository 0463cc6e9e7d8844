// The OpenAPI 3 document of the REST API (served at /openapi.json), generated at run time from
// the route table and the protobuf descriptors of the routes' request and response messages, so
// that it cannot drift from the protos: one path item per route path, one schema per message
// (named by its full name, e.g. tessera.v1.SearchRequest), fields by their JSON names and types
// as protobuf's JSON mapping writes them (64-bit integers as strings, bytes as base64, enums by
// name), with the gateway's two conveniences (server/http/json_mapping.h): ids as text, and a
// Matrix also as nested arrays of numbers.
#ifndef TESSERA_SERVER_HTTP_OPENAPI_H_
#define TESSERA_SERVER_HTTP_OPENAPI_H_

#include <string>
#include <vector>

#include "server/http/rest_gateway.h"

namespace tessera::server {

// The document as JSON.
std::string OpenApiDocument(const std::vector<RestRoute>& routes);

}  // namespace tessera::server

#endif  // TESSERA_SERVER_HTTP_OPENAPI_H_

// Connects to the coordinator named by argv[1] with the installed SDK and prints
// "workers: N" (exit 0), or the error (exit 1).
#include <iostream>

#include "client/sdk/client.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: sdk_consumer HOST:PORT\n";
    return 2;
  }
  auto client = pipetrain::client::Client::Connect(argv[1]);
  if (!client.ok()) {
    std::cout << client.status() << "\n";
    return 1;
  }
  auto workers = (*client)->ListWorkers();
  if (!workers.ok()) {
    std::cout << workers.status() << "\n";
    return 1;
  }
  std::cout << "workers: " << workers->size() << "\n";
  return 0;
}

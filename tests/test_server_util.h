// An in-process `clef serve` on a free loopback port with the tiny fixture model, for the server tests.
#pragma once

#include <httplib.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <thread>

#include "decision/engine.h"
#include "server/server.h"
#include "test_util.h"

namespace clef::testing {

class RunningServer {
public:
    // The tiny fixture model loaded with `load` (LoadOptions: the device, the state cache).
    explicit RunningServer(ServerOptions opt, LoadOptions load = {}) {
        opt.host = "127.0.0.1";
        opt.port = 0;
        const std::string model = data_path("tiny-clef");
        server_ = std::make_unique<Server>(opt, [model, load] { return Engine::load(model, "", load); });
        if (!server_->bind()) throw std::runtime_error(server_->error());
        thread_ = std::thread([this] { server_->run(); });
        for (int i = 0; i < 4000 && !server_->ready(); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        if (!server_->ready()) {
            server_->stop();
            thread_.join();
            throw std::runtime_error("server not ready: " + server_->error());
        }
    }
    ~RunningServer() {
        server_->stop();
        thread_.join();
    }
    httplib::Client client() const {
        httplib::Client c("127.0.0.1", server_->port());
        c.set_read_timeout(600, 0);  // a loaded CI machine can be slow; a hang still fails the test
        return c;
    }
    Server& server() { return *server_; }

private:
    std::unique_ptr<Server> server_;
    std::thread thread_;
};

// One in-process server over tiny-clef per test program, answering to "tiny-clef" and "clef-flash".
inline RunningServer& tiny_clef_server() {
    static RunningServer r([] {
        ServerOptions o;
        o.model_name = "tiny-clef";
        o.aliases = {"clef-flash"};
        return o;
    }());
    return r;
}

// POST /v1/systemone to tiny_clef_server().
inline httplib::Result post_decision(const std::string& body) {
    return tiny_clef_server().client().Post("/v1/systemone", body, "application/json");
}

}  // namespace clef::testing
